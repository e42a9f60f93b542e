"""Training the scratch model on the user's pictures (or fine-tuning a checkpoint).

- :mod:`.data`: procedural shapes with boxes, ImageFolders in memory, CIFAR-10;
- :mod:`.augment`: batched augmentation on uint8 tensors;
- :mod:`.recipe`: hyper-parameters, the from-scratch architecture, optimiser and schedule;
- :mod:`.loop`: the run itself (resumable, torchrun-ready).
"""
