"""faultline core: models, errors, configuration and the command line."""
