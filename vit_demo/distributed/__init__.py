"""Work shared between processes: the torchrun job every sharded command joins (:mod:`.torchrun`)."""
