"""Re-pickles mlp_adam_3steps.pickle at protocols 2, 3 and 5 (the sample is protocol 4), so
tests can check that every protocol imports to the same trace. Run: python3 repickle.py"""
import pickle

with open("mlp_adam_3steps.pickle", "rb") as f:
    snapshot = pickle.load(f)
for proto in (2, 3, 5):
    with open(f"mlp_adam_3steps.protocol{proto}.pickle", "wb") as f:
        pickle.dump(snapshot, f, protocol=proto)
