"""kvtrace: find KV-transfer poll states that pin SGLang's disaggregated prefill queue."""

__version__ = "0.1.0"
