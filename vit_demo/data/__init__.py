"""What a folder of pictures says about its pictures, read by training and evaluation alike.

- :mod:`.annotations`: a shapes folder's ``boxes.json``: every shape's box and every watermark's box
  (written by :func:`vit_demo.train.data.make_shapes`; the pointing game and the survey read them).

It sits below ``train`` and ``evaluate``, which do not import each other (import-linter).
"""
