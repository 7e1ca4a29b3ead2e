"""Running pipelines in process: the epoch coordinator, the pipeline, the delivery rules."""
