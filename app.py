"""The vit_demo app. Until the Gradio app lands, this prints how to use the CLI."""

import sys

if __name__ == "__main__":
    print("The Gradio app is not built yet. Meanwhile, the command line:\n"
          "  python -m vit_demo predict IMAGE --weights FILE\n"
          "  python -m vit_demo verify --model NAME --weights FILE\n"
          "  python -m vit_demo --help")
    sys.exit(0)
