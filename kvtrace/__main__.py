"""`python -m kvtrace`, and the `kvtrace` console script (pyproject.toml's entry point names
`console`): both start the same way."""

import gc


def console() -> None:
    """The `kvtrace` command. The imports build only what lives as long as the process (modules,
    classes, typer's command): the cyclic collector's passes over them find nothing, so they run
    with it off; run() freezes what they built and turns it back on."""
    gc.disable()
    from kvtrace.cli import run

    run()


if __name__ == "__main__":
    console()
