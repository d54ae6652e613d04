"""Analysis: layer-wise novelty (`novelty`; its stored form, torch-free: `novelty_record`),
model loading for analysis (`sources`), PNG plots (`plots`) and the statistics of paired results (`stats`: paired differences, t quantiles,
correlation; numpy only when called). Submodules are imported on demand so
`import taperlm.analysis` stays light (compare's torch-free planning imports `stats`)."""
