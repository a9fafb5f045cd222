"""The recipe room: load, bind, override, check and compose a recipe into a run."""
