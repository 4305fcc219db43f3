"""`choir`: `choir serve [MODEL] [FLAGS]` (vllm serve's command line), `choir batch -i IN -o OUT [MODEL] [FLAGS]`
(a Batch API file run offline, as vLLM's run_batch), `choir --version`."""

import sys

USAGE = """usage: choir serve [MODEL] [options]   serve MODEL (`choir serve --help`: the options)
       choir batch -i IN -o OUT [MODEL] [options]
                                          run a Batch API file offline (`choir batch --help`)
       choir --version                    Choir's version"""


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["serve"]:
        from choir.cli import serve

        serve.main(args[1:])
    elif args[:1] == ["batch"]:
        from choir.cli import batch

        batch.main(args[1:])
    elif args[:1] in (["--version"], ["-V"]):
        import choir

        print(f"choir {choir.__version__}")
    elif args[:1] in (["--help"], ["-h"]):
        print(USAGE)
    else:
        print(USAGE, file=sys.stderr)
        sys.exit(2)
