"""``python -m lifeline.models.gpt_moe``: the reference trainer under the Lifeline runtime."""

from lifeline.runtime.cli import main

if __name__ == "__main__":
    main()
