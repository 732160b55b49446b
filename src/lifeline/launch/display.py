"""The live progress display of ``lifeline run`` (rich): step, loss, tokens/s, the latest step
complete at each tier (L0/L1/L2), generation, recoveries, and the latest events."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

__all__ = ["ProgressDisplay", "render"]


def _fmt(value: Any, spec: str = "") -> str:
    return "—" if value is None else format(value, spec)


def render(snap: Any) -> Group:
    """A renderable of a :class:`~lifeline.launch.supervisor.Snapshot`."""
    table = Table(title=f"lifeline run · {snap.job} · layout {snap.layout.to_wire()}", show_header=False,
                  expand=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    table.add_row("phase", snap.phase)
    table.add_row("step", f"{snap.step} / {snap.steps}")
    table.add_row("loss", _fmt(snap.loss, ".4f"))
    table.add_row("tokens/s", _fmt(snap.tokens_per_s, ",.0f"))
    tiers = snap.tiers or {}
    table.add_row("complete", "   ".join(f"{t} {_fmt(tiers.get(t))}" for t in ("L0", "L1", "L2")))
    table.add_row("generation", str(snap.generation))
    table.add_row("recoveries", str(len(snap.recoveries)))
    table.add_row("elapsed", f"{time.time() - snap.started_at:.1f} s")
    events = Text("\n".join(snap.events[-6:]), style="dim")
    return Group(table, events)


class ProgressDisplay:
    """A rich ``Live`` view refreshed at most ``fps`` times a second; a no-op when ``enabled`` is
    False (``--json`` or no terminal), in which case events are printed as plain lines to stderr."""

    def __init__(self, *, enabled: bool, fps: float = 4.0, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.enabled = enabled and self.console.is_terminal
        self.period = 1.0 / fps
        self._last = 0.0
        self._printed = 0
        self._live: Live | None = None

    def __enter__(self) -> ProgressDisplay:
        if self.enabled:
            self._live = Live(console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)
            self._live = None

    def update(self, snap: Any) -> None:
        """Show ``snap`` (rate-limited) or print its new events."""
        if self._live is None:
            for line in snap.events[self._printed:]:
                self.console.print(line, highlight=False, markup=False)
            self._printed = len(snap.events)
            return
        now = time.monotonic()
        if now - self._last >= self.period or snap.phase in ("Succeeded", "Failed"):
            self._last = now
            self._live.update(render(snap))
