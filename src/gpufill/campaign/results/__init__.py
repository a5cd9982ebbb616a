"""What a workdir's store holds, read back: status, results and the best configurations (reading), the stored test
forecasts and ensembles of them (ensembles), each row's effective configuration and what makes it stale
(provenance), and files out (export). Imports campaign.store (and campaign.spec for types)."""
