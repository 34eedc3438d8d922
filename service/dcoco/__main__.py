import sys

from dcoco.cli import main

if __name__ == "__main__":  # vLLM's spawned processes re-import the main module
    sys.exit(main())
