"""``python -m zcluster.cli``: the ``zcluster`` command."""

from zcluster.cli import main

if __name__ == "__main__":
    main()
