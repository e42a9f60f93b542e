"""The server's protections and settings, apart from the page (no module here knows a tab or a section).

- :mod:`~vit_demo.app.server.settings`: :class:`~vit_demo.app.server.settings.ServerSettings`,
  the one object the three phases of start-up read (``app.py``, ``build()``, ``launch_kwargs()``);
  :mod:`~vit_demo.app.server.limits`: the flags' numbers in it (:class:`Limits`).
- Who a client is: :mod:`~vit_demo.app.server.clients` (an address, an IPv6 one by its /64).
- Before a request: :mod:`~vit_demo.app.server.connections` (connections per client and in all,
  response streams, the time to send headers and bodies), :mod:`~vit_demo.app.server.middleware` (the gate: Host,
  body size and framing, upload budget charged as bytes arrive, short errors),
  :mod:`~vit_demo.app.server.masking` (exposed: no server path in what is sent).
- At the queue: :mod:`~vit_demo.app.server.lanes` (the door and the two lanes) and
  :mod:`~vit_demo.app.server.guard` (which files and values a request may carry).
- Memory, disk and log: :mod:`~vit_demo.app.server.lean` (Gradio's sessions without a copy of the
  page, those holding nothing forgotten first), :mod:`~vit_demo.app.server.spool` (Gradio's
  uploads while they arrive: no open file between chunks, nothing left of a cut one),
  :mod:`~vit_demo.app.server.workspace` (the app's own temp folder and its disk budget),
  :mod:`~vit_demo.app.server.quietlog` (repeated log lines dropped).
- :mod:`~vit_demo.app.server.fetch`: a picture from a public web address, for a local app's MCP tools.

Only :mod:`~vit_demo.app.server.lean` and :mod:`~vit_demo.app.server.spool` import Gradio
(pyproject's import-linter contracts).
"""
