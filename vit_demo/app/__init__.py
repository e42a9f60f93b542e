"""The Gradio app, one module per room.

- :mod:`~vit_demo.app.build`: ``build(cfg)`` assembles the page from the rooms below;
  :mod:`~vit_demo.app.page` holds its look (theme, CSS) and launch settings.
- :mod:`~vit_demo.app.registry` (the shared models and analyses) and
  :mod:`~vit_demo.app.session` (one user's upload and view): no Gradio.
- :mod:`~vit_demo.app.context`: the :class:`Section` shape every room has, and the
  :class:`Context` it is given; :mod:`~vit_demo.app.flow`: the upload event every room shows.
- Rooms, each with its layout, events and views: :mod:`~vit_demo.app.models` (model picker),
  :mod:`~vit_demo.app.inputs` (input and predictions), :mod:`~vit_demo.app.display` (colormap,
  opacity, smoothing), and the tabs :mod:`~vit_demo.app.patches`, :mod:`~vit_demo.app.attention`,
  :mod:`~vit_demo.app.methods` (rollout and relevance), :mod:`~vit_demo.app.diagnostics`,
  :mod:`~vit_demo.app.compare` (with timm).
- Shared bits: :mod:`~vit_demo.app.common` (errors, notes, pictures for the browser) and
  :mod:`~vit_demo.app.exports` (slide PNGs).

Importing this package imports nothing else: ``vit_demo.app.registry`` and
``vit_demo.app.session`` stay free of Gradio.

Named API endpoints (``gradio_client``): ``/predict`` (image, model, k -> JSON top-k),
``/analyze`` (the upload event), ``/attention`` (the explorer's re-render) and ``/compare``.
"""
