"""kvtrace: find KV-transfer poll states that pin SGLang's disaggregated prefill queue."""

from __future__ import annotations

import threading
from typing import Any, Callable

__version__ = "0.1.0"


class LazyLog:
    """The "kvtrace" logger, with `logging` imported only when a line is said at a level that is
    shown: most runs (no -v) say nothing, and the import cost each of them a few milliseconds.
    cli.setup_logging leaves the handlers to set up here, before the first line it shows."""

    DEBUG, WARNING = 10, 30

    def __init__(self) -> None:
        self.level = self.WARNING
        self.pending: Callable[[], None] | None = None
        self._setting_up = threading.Lock()  # a fleet's threads may say their first lines at once

    def debug(self, message: str, *args: Any, **kwargs: Any) -> None:
        if self.level <= self.DEBUG:
            self._say(self.DEBUG, message, args, kwargs)

    def warning(self, message: str, *args: Any, **kwargs: Any) -> None:
        if self.level <= self.WARNING:
            self._say(self.WARNING, message, args, kwargs)

    def _say(self, level: int, message: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        import logging

        if self.pending is not None:
            with self._setting_up:
                setup, self.pending = self.pending, None
                if setup is not None:
                    setup()
        logging.getLogger("kvtrace").log(level, message, *args, **kwargs)


log = LazyLog()
