"""SGLang, laid out as an installed package (kvtrace fixture "installed-layout")."""

__version__ = "0.0.0+kvtrace.fixture"
