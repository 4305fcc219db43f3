"""From a validated request to engine calls and back to OpenAI responses."""
