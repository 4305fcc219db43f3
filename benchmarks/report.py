"""benchmarks/results/frontends.json as Markdown: one row per scenario, the contestants side by side.

    python -m benchmarks.report [path/to/frontends.json]
"""

import json
import sys

from benchmarks.frontends import RESULTS

COLUMNS = ("choir", "vllm", "rust", "engine")


def _cell(row: dict, key: str, fmt: str) -> str:
    return format(row[key], fmt) if row and key in row else "–"


def render(data: dict) -> str:
    medians = data["medians"]
    names = [name for name in COLUMNS if any(name in by_name for by_name in medians.values())]
    head = ["scenario", *(f"{n} cpu ms" for n in names), "cpu ÷ vLLM",
            *(f"{n} req/s" for n in names), "req/s ÷ vLLM", "TTFT p50 ms choir / vllm"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, by_name in medians.items():
        choir, vllm = by_name.get("choir"), by_name.get("vllm")
        cpu_ratio = rps_ratio = "–"
        if choir and vllm:
            cpu_ratio = f"{choir['frontend_cpu_ms_per_request'] / vllm['frontend_cpu_ms_per_request']:.2f}"
            rps_ratio = f"{choir['requests_per_s'] / vllm['requests_per_s']:.2f}"
        ttft = f"{_cell(choir, 'ttft_p50_ms', '.1f')} / {_cell(vllm, 'ttft_p50_ms', '.1f')}" if "stream" in label \
            else "–"
        lines.append("| " + " | ".join([label, *(_cell(by_name.get(n), "frontend_cpu_ms_per_request", ".2f")
                                               for n in names), cpu_ratio,
                                         *(_cell(by_name.get(n), "requests_per_s", ".1f") for n in names),
                                         rps_ratio, ttft]) + " |")
    lines.append("")
    for name, verdict in data.get("targets", {}).items():
        if verdict and "met" in verdict:
            lines.append(f"- `{name}`: met in {verdict['met']}/{verdict['of']}; min {verdict['min']:.2f}, "
                         f"median {verdict['median']:.2f}, max {verdict['max']:.2f}")
    return "\n".join(lines)


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else RESULTS / "frontends.json"
    with open(path) as file:
        print(render(json.load(file)))


if __name__ == "__main__":
    main()
