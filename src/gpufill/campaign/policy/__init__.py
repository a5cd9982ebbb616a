"""The scheduler's decisions, on plain values (no store, executor or clock): each lane's slots and threads (lanes), the
waiting trials by shape (queue), GPU admission by measured memory (admission), what runs next (policy), and how long
a run waits for its environment (environment). Imports nothing else of the campaign."""
