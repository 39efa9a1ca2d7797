"""LSTM / GRU / RNN converters (placeholder module: filled in by the RNN work)."""
