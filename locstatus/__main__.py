"""``python -m locstatus``: the same command line as the ``locstatus`` console script."""

from locstatus.cli import main

if __name__ == "__main__":
    main()
