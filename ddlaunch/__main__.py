"""``python -m ddlaunch``: the same entry point as the ``ddlaunch`` console script."""

from ddlaunch.entry import main

if __name__ == "__main__":
    main()
