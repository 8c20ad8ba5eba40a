"""The runtime: the processes that run postroom's work (workers, their duties, the dispatcher).

Everything here uses only the public names of the layers below (the store, its records);
nothing here is needed to use a store from a program of one's own.
"""
