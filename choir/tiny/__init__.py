"""The tiny random-weight models Choir develops and tests against, built here, nothing downloaded:
`choir-tiny-models` (or `python -m choir.tiny`). Not serving code: nothing under choir/ imports this package,
and it imports nothing of Choir's serving side (pyproject's [tool.importlinter])."""
