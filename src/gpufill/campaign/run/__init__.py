"""A run: `Campaign`, the API behind `gpufill run`, `status` and `results` (runner); the scheduler loop that carries out
campaign.policy's decisions through an executor and is the store's only writer (scheduler); its progress, start-up
timeline and stop on signals; and `gpufill estimate` (estimate). The top of the campaign: no other folder imports it."""
