"""Which trials a campaign holds: the grid's expansion and content-hash ids (trials), a search's rounds of proposals
(search) and its pruner inside a training (pruning). Imports campaign.spec and campaign.store."""
