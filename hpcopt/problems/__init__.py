"""Problems: a model, a loss and this rank's data, seen by algorithms as a gradient oracle."""
