"""``python -m lifeline <role>``: one image, every role."""

from lifeline.cli import main

if __name__ == "__main__":
    main()
