"""vLLM's own server-talking OpenAI tests, run against Choir (and, for the baseline, against `vllm serve`).

`python -m conformance` (or `make vllm-suite`) fetches the source distribution of the engine version Choir
pins, runs the modules `selection.yaml` names with the pytest plugin `conformance.plugin` (which replaces
vLLM's `RemoteOpenAIServer` with a Choir started for the test's flags), and checks the outcome against
`expected.yaml`: the tests that pass on `vllm serve` but not on Choir, each with its reason, and the tests
that fail on both. `--against-vllm` runs the same tests on `vllm serve` and rewrites the baseline.
"""
