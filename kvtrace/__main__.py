import gc

# The imports build only what lives as long as the process (modules, classes, typer's command):
# the cyclic collector's passes over them find nothing. run() freezes them and turns it back on.
gc.disable()

from kvtrace.cli import run  # noqa: E402

run()
