"""Work beside the pipeline, on timers: the content index filled (`indexer`),
old events purged (`retention`), alerts grouped and sent (`alerts`), memory and
the database watched (`memory`, `dbwatch`), and which instance of a cluster
runs the singletons (`leadership`)."""
