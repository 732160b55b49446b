"""``python -m lifeline.models.gpt_moe``: the reference trainer under the Lifeline runtime."""

from lifeline.models.gpt_moe._main import main

if __name__ == "__main__":
    main()
