"""`python -m conformance`: vLLM's server-talking OpenAI tests against Choir, checked against expected.yaml.

    python -m conformance                      # on Choir; fails on a failure expected.yaml does not list
    python -m conformance --against-vllm       # on `vllm serve`: rewrites expected.yaml's baseline
    python -m conformance --record             # on Choir, and writes new failures (TODO reasons) and drops stale
                                               # entries in expected.yaml's `differences`
    python -m conformance --module tests/entrypoints/openai/test_return_token_ids.py -k emoji
    python -m conformance --show test_single_completion    # both servers' exchanges for matching tests
    python -m conformance --last --record      # the last Choir run's results into expected.yaml, no new run
    python -m conformance -- -x                # anything after `--` goes to pytest

The last results of each mode are kept in .cache/vllm-suite/results/{choir,vllm}.json, the servers' logs in
.cache/vllm-suite/logs/.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from conformance.source import CACHE, ROOT, engine_version, extract_tests, fake_hf_cache, module_paths, short

HERE = Path(__file__).resolve().parent
SELECTION = HERE / "selection.yaml"
EXPECTED = HERE / "expected.yaml"
FAILED = ("failed", "error", "incomplete")
HEADER = """\
# What `make vllm-suite` expects of vLLM {version}'s server-talking OpenAI tests (conformance/selection.yaml)
# on Choir, on the bundled model with Choir's engine flags.
#
# differences:  tests that pass on `vllm serve` but not on Choir, each with its reason. Kept by hand:
#               `python -m conformance --record` adds new failures with a TODO reason and drops entries that
#               now pass (stale); write the reason in place of the TODO.
# fail_on_vllm: tests that fail on `vllm serve` too (with this tiny random model on CPU, mostly), and so are
#               not Choir's to pass: ignored on Choir. Written by `make vllm-suite SUITE_ARGS=--against-vllm`,
#               with vLLM's failure.
# A test listed in neither must pass (or skip) on Choir.
"""


def load_expected() -> dict:
    data = yaml.safe_load(EXPECTED.read_text()) if EXPECTED.is_file() else None
    data = data or {}
    data.setdefault("differences", {})
    data.setdefault("fail_on_vllm", {})
    data["differences"] = data["differences"] or {}
    data["fail_on_vllm"] = data["fail_on_vllm"] or {}
    return data


def save_expected(data: dict, version: str) -> None:
    lines = [f"engine: {json.dumps(version)}", f"vllm_serve: {json.dumps(data.get('vllm_serve', {}))}"]
    for section in ("differences", "fail_on_vllm"):  # one line per test (JSON strings are YAML scalars)
        entries = sorted(data[section].items())
        lines.append(f"{section}:" + ("" if entries else " {}"))
        lines += [f"  {json.dumps(node)}: {json.dumps(reason, ensure_ascii=False)}" for node, reason in entries]
    EXPECTED.write_text(HEADER.format(version=version) + "\n" + "\n".join(lines) + "\n")
    if yaml.safe_load(EXPECTED.read_text())["differences"] != data["differences"]:
        raise AssertionError(f"{EXPECTED} does not read back")


def check_selection(root: Path, selection: dict) -> None:
    present = set(module_paths(root))
    run, left_out = selection["modules"]["run"], selection["modules"]["left_out"]
    listed = set(run) | set(left_out)
    problems = [f"not in the sdist: {m}" for m in sorted(listed - present)]
    problems += [f"not sorted (add it to `run` or `left_out` in {SELECTION.name}): {m}"
                 for m in sorted(present - listed)]
    problems += [f"both run and left out: {m}" for m in sorted(set(run) & set(left_out))]
    if problems:
        raise SystemExit("vllm-suite: the selection does not match the tests:\n  " + "\n  ".join(problems))


def run_pytest(mode: str, root: Path, hub: Path, modules: list[str], keyword: str | None, extra: list[str]) -> dict:
    report = CACHE / "results" / f"{mode}.json"
    report.unlink(missing_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "HF_HUB_CACHE": str(hub),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_HOST_IP": "127.0.0.1",
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        "CONFORMANCE_MODE": mode,
        "CONFORMANCE_REPORT": str(report),
        "CONFORMANCE_LOGS": str(CACHE / "logs"),
        "CONFORMANCE_SELECTION": str(SELECTION),
        "CONFORMANCE_SOURCE": str(root),
    }
    command = [sys.executable, "-m", "pytest", "-c", str(HERE / "pytest.ini"), "--rootdir", str(root),
               "--confcutdir", str(root / "tests" / "entrypoints"), "-p", "conformance.plugin",
               "-p", "no:cacheprovider", "-q", "-rN", "--tb=line", *modules]
    if keyword:
        command += ["-k", keyword]
    command += extra
    print(f"vllm-suite: {len(modules)} modules on {'vllm serve' if mode == 'vllm' else 'Choir'}", flush=True)
    code = subprocess.call(command, cwd=root, env=env)
    if not report.is_file():
        raise SystemExit(f"vllm-suite: pytest exited with {code} and wrote no report")
    return json.loads(report.read_text())


def counts(tests: dict) -> dict[str, int]:
    out: dict[str, int] = {}
    for result in tests.values():
        out[result["outcome"]] = out.get(result["outcome"], 0) + 1
    return dict(sorted(out.items()))


def against_vllm(results: dict, expected: dict, partial: bool) -> int:
    tests = results["tests"]
    failing = {node: short(r.get("message", ""), 200) for node, r in tests.items() if r["outcome"] in FAILED}
    passing = {node for node, r in tests.items() if r["outcome"] == "passed"}
    if partial:  # a subset ran: update what ran, keep the rest
        fail_on_vllm = {n: m for n, m in expected["fail_on_vllm"].items() if n not in tests}
        fail_on_vllm.update(failing)
    else:
        fail_on_vllm = failing
    moved = sorted(n for n in expected["differences"] if n in failing)
    for node in moved:
        print(f"  now fails on vLLM too (moved to fail_on_vllm): {node}")
        del expected["differences"][node]
    gone = sorted(n for n in expected["differences"] if n not in tests and not partial)
    for node in gone:
        print(f"  no longer collected (dropped): {node}")
        del expected["differences"][node]
    expected["fail_on_vllm"] = fail_on_vllm
    if not partial:
        expected["vllm_serve"] = {"passed": len(passing), "failed": len(failing),
                                  "skipped": len(tests) - len(passing) - len(failing)}
    return 0


def against_choir(results: dict, expected: dict, partial: bool, record: bool, strict: bool) -> int:
    tests = results["tests"]
    differences, fail_on_vllm = expected["differences"], expected["fail_on_vllm"]
    unexpected = {n: r for n, r in tests.items() if r["outcome"] in FAILED and n not in differences
                  and n not in fail_on_vllm}
    stale = sorted(n for n in differences if tests.get(n, {}).get("outcome") in ("passed", "skipped", "xfailed"))
    missing = [] if partial else sorted(n for n in differences if n not in tests)
    better = sorted(n for n in fail_on_vllm if tests.get(n, {}).get("outcome") == "passed")
    if better:
        print(f"\n{len(better)} test(s) fail on vllm serve but pass on Choir (fine):")
        for node in better:
            print(f"  {node}")
    if stale or missing:
        print(f"\n{len(stale) + len(missing)} stale entr(y/ies) in {EXPECTED.name} `differences`:")
        for node in stale:
            print(f"  now {tests[node]['outcome']} on Choir: {node}")
        for node in missing:
            print(f"  not collected: {node}")
    if unexpected:
        print(f"\n{len(unexpected)} unexpected failure(s) on Choir (not in {EXPECTED.name}):")
        for node, result in sorted(unexpected.items()):
            print(f"  {node}\n      {short(result.get('message', ''), 400)}")
    if record:
        for node in [*stale, *missing]:
            del differences[node]
        for node, result in unexpected.items():
            differences[node] = "TODO: " + short(result.get("message", ""), 200)
        return 0
    if unexpected or (strict and (stale or missing)):
        return 1
    return 0


def show(pattern: str) -> int:
    """Both modes' outcome and exchanges for the tests whose node id contains `pattern`."""
    runs = {}
    for mode in ("vllm", "choir"):
        path = CACHE / "results" / f"{mode}.json"
        if path.is_file():
            runs[mode] = json.loads(path.read_text())["tests"]
    nodes = sorted({n for tests in runs.values() for n in tests if pattern in n})
    for node in nodes:
        print(f"=== {node}")
        for mode, tests in runs.items():
            result = tests.get(node)
            if result is None:
                continue
            print(f"--- {mode}: {result['outcome']} {result.get('message', '')}")
            for exchange in result.get("exchanges", []):
                print(f"  > {exchange['request']} {exchange['body']}")
                print(f"  < {exchange.get('status')} {exchange.get('answer', '')}")
    return 0 if nodes else 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, extra = argv[:at], argv[at + 1:]
    parser = argparse.ArgumentParser(prog="python -m conformance", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against-vllm", action="store_true", help="run on `vllm serve`; rewrite the baseline")
    parser.add_argument("--record", action="store_true", help="write new Choir failures (TODO) and drop stale ones")
    parser.add_argument("--strict", action="store_true", help="stale entries fail the run too")
    parser.add_argument("--module", action="append", help="run only this module (repeatable)")
    parser.add_argument("-k", dest="keyword", help="pytest -k expression")
    parser.add_argument("--show", metavar="PATTERN", help="print the last runs' exchanges for matching tests")
    parser.add_argument("--last", action="store_true", help="check (or --record) the last run's results; run nothing")
    args = parser.parse_args(argv)
    if args.show:
        return show(args.show)

    version = engine_version()
    root = extract_tests(version)
    selection = yaml.safe_load(SELECTION.read_text())
    check_selection(root, selection)
    hub = fake_hf_cache(selection["models"])
    modules = args.module or selection["modules"]["run"]
    partial = bool(args.module or args.keyword or extra)
    mode = "vllm" if args.against_vllm else "choir"

    began = time.monotonic()
    if args.last:
        last = CACHE / "results" / f"{mode}.json"
        if not last.is_file():
            raise SystemExit(f"vllm-suite: no last run ({last})")
        results = json.loads(last.read_text())
        partial = bool(results.get("partial", True))
    else:
        results = run_pytest(mode, root, hub, modules, args.keyword, extra)
        results["partial"] = partial
        (CACHE / "results" / f"{mode}.json").write_text(json.dumps(results, indent=1))
    wall = time.monotonic() - began
    tests = results["tests"]
    starts = [s.get("start_seconds", 0) for s in results["servers"]]
    print(f"\nvllm-suite on {'vllm serve' if mode == 'vllm' else 'Choir'} (vLLM {version}): {counts(tests)}; "
          f"{len(results['servers'])} server start(s), {sum(starts):.0f}s starting; wall {wall:.0f}s")
    for server in results["servers"]:
        for note in server["notes"]:
            print(f"  {server['module']}: {note}")

    if results.get("exit_status") == 2:  # pytest's INTERRUPTED
        print("vllm-suite: interrupted; nothing checked or written")
        return 2
    expected = load_expected()
    if mode == "vllm":
        code = against_vllm(results, expected, partial)
        save_expected(expected, version)
        print(f"wrote {EXPECTED.relative_to(ROOT)}")
        return code
    code = against_choir(results, expected, partial, args.record, args.strict)
    if args.record:
        save_expected(expected, version)
        print(f"wrote {EXPECTED.relative_to(ROOT)}")
    elif code == 0:
        print("\nvllm-suite: OK (every Choir failure is listed in expected.yaml)")
    return code


if __name__ == "__main__":
    sys.exit(main())
