"""Transitional: the names app/parsers_plugin.py and app/serve.py import. The parsers are the engine
adapter's now (plugins/engine/vllm_parsers.py), and the serving side uses them through the seam's
types (plugins/engine/parsing.py); this module goes once those two import from there."""

from plugins.engine.vllm_parsers import VllmParsers as ParserSet
from plugins.engine.vllm_parsers import parser_classes

__all__ = ["ParserSet", "parser_classes"]
