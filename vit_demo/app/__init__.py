"""The Gradio app, one module per section of the page.

- :mod:`~vit_demo.app.build`: ``build(cfg)`` assembles the page from the sections below (the
  tabs in :data:`~vit_demo.app.build.TABS`); :mod:`~vit_demo.app.page` holds its look (theme,
  CSS) and launch settings; :mod:`~vit_demo.app.server.limits` what an exposed app accepts.
- :mod:`~vit_demo.app.registry` (the shared models and analyses), :mod:`~vit_demo.app.session`
  (one user's upload and view) and :mod:`~vit_demo.app.examples` (the example photos): no Gradio.
- :mod:`~vit_demo.app.context`: the :class:`Section` shape every section has, and the
  :class:`Context` it is given; :mod:`~vit_demo.app.flow`: the upload event every section shows.
- :mod:`~vit_demo.app.sections`: the parts above the tabs (model picker, input and predictions,
  display controls); :mod:`~vit_demo.app.tabs`: one module per tab.
- Shared bits: :mod:`~vit_demo.app.common` (errors, notes, pictures for the browser),
  :mod:`~vit_demo.app.exports` (slide PNGs) and :mod:`~vit_demo.app.motion` (animations).

Importing this package imports nothing else: ``vit_demo.app.registry`` and
``vit_demo.app.session`` stay free of Gradio.

Named API endpoints (``gradio_client``), each parameter named and none moved by a new control:
``/predict`` (image, model, k -> JSON top-k), ``/analyze`` (image, model: the upload event's twin,
the tabs' settings at their defaults), ``/attention`` (layer, head, query, patch, cmap, alpha, smooth:
the explorer's re-render) and ``/compare`` (k).
"""
