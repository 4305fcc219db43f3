"""`python -m choir serve ...`: the `choir` command."""

from choir.cli.main import main

if __name__ == "__main__":
    main()
