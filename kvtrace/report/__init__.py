"""Report writers: text (rich), json (the kvtrace/1 contract), sarif, markdown."""
