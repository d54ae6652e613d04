"""Analysis: layer-wise novelty (`novelty`), model loading for analysis (`sources`) and PNG
plots (`plots`). Submodules are imported on demand so `import taperlm.analysis` stays light."""
