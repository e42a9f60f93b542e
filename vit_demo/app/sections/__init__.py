"""The parts of the page above the tabs: the model picker, the input and predictions, the display controls."""
