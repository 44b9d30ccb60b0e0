"""responses-proxy: the OpenAI Responses API in front of Chat Completions servers."""

# The one place the version is written: the package's metadata reads it (setup.cfg), and so do
# `--version`, /health and the metrics' build info. CHANGELOG.md says what each one changed.
__version__ = "0.2.0"
