"""A campaign's workdir: its SQLite store (store: the trial state machine, the one writer's side; store_queries: the
reads; store_health: damage and a full disk as one line), the one-run lock (lock), and the files a run writes and
`--fresh` deletes (workdir). Imports only campaign.policy (the queue's entries)."""
