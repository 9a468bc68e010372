"""`python -m vllm_treespec ...`: the same as the `vllm-treespec` console script."""
import sys

from vllm_treespec.cli import main

if __name__ == "__main__":
    sys.exit(main())
