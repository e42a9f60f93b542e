"""What the sections of the app share: the command line's settings (:class:`AppConfig`), the
:class:`Context` every section is given (the registry, the session state, the shared controls),
and :class:`Section`, the shape of a section.

A section (a tab, or a part of the page above the tabs) lays out its components in
:meth:`Section.layout`, wires its own events in :meth:`Section.wire`, and declares what it
shows for a new analysis (:meth:`Section.show` and the ``views`` / ``controls`` / ``files``
it writes); :mod:`vit_demo.app.flow` runs every section's ``show`` when an image or a model
changes. Adding a control or a button to a tab touches that tab's module only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..checkpoints.load import LoadedModel
from .registry import ModelRegistry
from .server.guard import FileGuard
from .server.limits import Limits
from .session import Session, SessionBudget

Component = Any  # a Gradio component (kept as Any: this module does not import Gradio)


@dataclass
class AppConfig:
    """What ``app.py`` passes in from the command line."""

    weights: list[str] = field(default_factory=list)
    model: str | None = None
    examples: list[str] = field(default_factory=list)
    device: str = "cpu"
    limits: Limits = field(default_factory=Limits)  # memory budgets, uploads, queue (exposed or not)
    mcp: bool = False  # the MCP tools (vit_demo.app.tools) and Gradio's MCP server
    precision: str = "auto"  # what the models run in: auto (bf16 where the device computes it natively), fp32, bf16

    @property
    def exposed(self) -> bool:
        """Bound to a non-loopback address or shared: no server-side paths from the UI."""
        return self.limits.exposed

    @property
    def max_queue(self) -> int:
        return self.limits.max_queue

    @property
    def concurrency(self) -> int:
        return self.limits.concurrency


class Section:
    """One section of the app: its layout, its events and its views. Override what the section needs.

    Lists of components, filled in by :meth:`layout`:

    - ``show_inputs``: the values :meth:`show` and :meth:`redisplay` read (``vals[component]``);
    - ``views``: what :meth:`show` draws for a new analysis (cleared when there is no image);
    - ``controls``: sliders and menus :meth:`show` re-ranges for a new analysis;
    - ``files``: files made on request (animations, decks), hidden again for every new analysis;
    - ``exports``: the "PNG for slides" buttons, on while there is an image to export;
    - ``lazy_outputs``: slower pictures drawn by :meth:`lazy` only while the tab is open;
    - ``redisplay_inputs`` / ``redisplay_outputs``: read and written by :meth:`redisplay` when
      the colormap, opacity or smoothing changes;
    - ``query_inputs`` / ``query_outputs``: read and written by :meth:`show_query` when the
      query patch changes (a click on a picture of the input: :mod:`vit_demo.app.query`).
    """

    name = ""  # the tab's id (also what Session.open_tab holds)
    title = ""  # the tab's label; "" for parts of the page above the tabs

    def __init__(self) -> None:
        self.show_inputs: list[Component] = []
        self.views: list[Component] = []
        self.controls: list[Component] = []
        self.files: list[Component] = []
        self.exports: list[Component] = []
        self.lazy_outputs: list[Component] = []
        self.redisplay_inputs: list[Component] = []
        self.redisplay_outputs: list[Component] = []
        self.query_inputs: list[Component] = []
        self.query_outputs: list[Component] = []
        self.gr_tab: Component | None = None  # the gr.Tab of a tab section, set by build()

    def layout(self, ctx: Context) -> None:
        """Create the components (inside the section's gr.Tab, or in the page)."""

    def wire(self, ctx: Context) -> None:
        """Attach the section's own events (every section is laid out by then)."""

    def show(self, sess: Session, lm: LoadedModel, vals: dict[Component, Any]) -> dict:
        """Outputs for a new analysis (``sess.analysis``) of the model ``lm``."""
        return {}

    def follow_up(self, dep: Any, ctx: Context) -> Any:
        """Chain slower work onto the new-analysis event ``dep`` (e.g. the class-specific maps, drawn
        as they are made); it starts as soon as the browser has the first pictures."""
        return dep

    def lazy(self, sess: Session) -> dict:
        """Slower pictures, drawn once per analysis when the tab is open."""
        return {}

    def on_open(self, dep: Any, ctx: Context) -> Any:
        """Chain work onto the tab's selection ``dep`` (after :meth:`show`), e.g. finishing pictures
        it drew as placeholders because their pass was still running."""
        return dep

    def redisplay(self, sess: Session, vals: dict[Component, Any]) -> dict:
        """Redraw for a new colormap, opacity or smoothing."""
        return {}

    def show_query(self, sess: Session, lm: LoadedModel, query: int, vals: dict[Component, Any]) -> dict:
        """Redraw for a new query patch (a click on a picture of the input; ``vals``: the values of
        every section's ``query_inputs``)."""
        return {}

    def warm_up(self, ctx: Context) -> None:
        """Slow work done once, in the background, when the app starts (app.py's warm-up), e.g. a cache."""


@dataclass
class Context:
    """What every section is given: the shared registry and state, and the controls other sections own."""

    cfg: AppConfig
    reg: ModelRegistry
    default_key: str
    examples: list = field(default_factory=list)
    heavy: dict = field(default_factory=dict)  # event settings for the ones that run a model (the model lane)
    waits: dict = field(default_factory=dict)  # ... for those that wait for work running elsewhere, then draw it
    slow: dict = field(default_factory=dict)  # ... for decks, slow methods, animations, exports (the slow lane)
    training: dict = field(default_factory=dict)  # ... for a training (the Train tab, /train: a lane of its own)
    sessions: SessionBudget | None = None  # the pictures all sessions keep, within a budget
    files: FileGuard | None = None  # the server files a request may name (uploads, examples)
    streams: Any = None  # the Live tab's streams: their rules, the door's book, the compute slot (server.streams)
    demo: Component = None
    state: Component = None  # the gr.State holding the user's Session
    sections: list[Section] = field(default_factory=list)
    # controls owned by one section and read by others (set by the owner's layout)
    model_dd: Component = None
    model_md: Component = None
    status: Component = None
    image: Component = None
    k: Component = None
    cmap: Component = None
    alpha: Component = None
    smooth: Component = None
    tabs: Component = None  # the gr.Tabs (a section may open another tab)
    folder_files: Component = None  # the Whole folder tab's pictures (the Atlas tab builds from them too)
    # set by vit_demo.app.flow: chain "analyse the image again" onto an event (``dep.then`` or ``dep.success``)
    reanalyze: Callable[[Callable], Any] | None = None

    def session(self, sess: Session | None) -> Session:
        """The user's session (a new one on the first event), able to recompute its analysis."""
        sess = sess if isinstance(sess, Session) else Session(model_key=self.default_key)
        reg = self.reg  # a plain function, not a bound method: nothing of the app is copied with the state
        sess.reanalyze = lambda s: reg.analyze(s.model_key, s.upload.picture)
        if self.sessions is not None:
            self.sessions.touch(sess)
        return sess

    def model(self, sess: Session) -> LoadedModel:
        return self.reg.get(sess.model_key)


def union(lists: Iterable[Iterable[Component]]) -> list[Component]:
    """The components of ``lists`` in order, each once."""
    out: list[Component] = []
    seen: set[int] = set()
    for items in lists:
        for c in items:
            if id(c) not in seen:
                seen.add(id(c))
                out.append(c)
    return out


def values(inputs: list[Component], args: Iterable[Any]) -> dict[Component, Any]:
    """An event's arguments keyed by the components they came from."""
    return dict(zip(inputs, args))
