"""A campaign's forecast past the end of the data: the chosen forecasters trained on all of it, with intervals."""
