"""The regime map ``aoq regimes`` (docs/regimes.md): in which kind of data does offline mining pay?"""
