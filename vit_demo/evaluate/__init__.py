"""Measuring explanations (metrics only: the command line is :mod:`vit_demo.cli`).

- :mod:`.curves`: deletion / insertion curves (Petsiuk et al. 2018), for any maps;
- :mod:`.faithfulness`: those curves over a folder of photos, every method and a random baseline;
- :mod:`.srg_saco`: SRG (Blücher et al. 2024) and SaCo (Wu et al. 2024), mean-colour or blurred replacement;
- :mod:`.sanity`: the model-randomisation check (Adebayo et al. 2018);
- :mod:`.pointing`: the pointing game on the shapes' boxes;
- :mod:`.survey`: a whole folder at once, a record per picture and the maps clustered per
  predicted class (:mod:`.clusters`: SpRAy's spectral clustering, the eigengap, t-SNE).
"""
