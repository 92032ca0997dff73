# The "Python Client Example" of the MemoryTracer API guide
# (../shared/seeds/000_2181d9a8825ccd47.txt), unchanged but for BASE_URL (taken from the
# environment) and the model ("my_transformer" is the zoo's "transformer"). The checks after
# the example assert the answers' fields and types as the guide lists them.
import os

import requests
import json

# API base URL
BASE_URL = os.environ["BASE_URL"]

# 1. Trace memory usage
trace_request = {
    "model_name": "transformer",
    "input_shape": [4, 128, 512],
    "batch_size": 4,
    "max_events": 10000,
    "enable_fragmentation": True
}

response = requests.post(f"{BASE_URL}/api/trace/memory", json=trace_request)
trace_data = response.json()

print(f"Peak Memory: {trace_data['peak_allocated_mb']:.2f} MB")
print(f"Fragmentation: {trace_data['avg_fragmentation']:.1%}")
print(f"Total Layers: {trace_data['total_layers']}")

# 2. List active traces
response = requests.get(f"{BASE_URL}/api/trace/list")
traces = response.json()
print(f"Active traces: {traces['active_traces']}")

# 3. Export as flame graph
if traces['active_traces']:
    trace_id = traces['active_traces'][0]
    
    export_request = {
        "trace_id": trace_id,
        "format": "speedscope"
    }
    
    response = requests.post(f"{BASE_URL}/api/trace/export", json=export_request)
    export_data = response.json()
    
    print(f"Exported to: {export_data['download_url']}")
    print(f"File size: {export_data['file_size_bytes']} bytes")

# 4. Clean up - delete trace
response = requests.delete(f"{BASE_URL}/api/trace/{trace_id}")
print(response.json()['message'])

# --- checks: the guide's fields and types -------------------------------------------------
assert isinstance(trace_data["model_name"], str) and trace_data["model_name"] == "transformer"
for key in ("total_events", "total_layers"):
    assert isinstance(trace_data[key], int) and trace_data[key] > 0, key
for key in ("peak_allocated_mb", "peak_reserved_mb", "avg_fragmentation", "tracing_time_ms"):
    assert isinstance(trace_data[key], (int, float)), key
assert trace_data["peak_allocated_mb"] > 0
assert 0.0 <= trace_data["avg_fragmentation"] <= 1.0
assert isinstance(trace_data["layer_stats"], dict) and trace_data["layer_stats"]
for name, s in trace_data["layer_stats"].items():
    assert s["layer_name"] == name
    for key in ("peak_allocated", "peak_reserved", "total_allocations", "total_deallocations"):
        assert isinstance(s[key], int), key
    for key in ("avg_fragmentation", "duration_ms"):
        assert isinstance(s[key], (int, float)), key
assert isinstance(traces["active_traces"], list) and isinstance(traces["count"], int)
assert traces["count"] == len(traces["active_traces"]) >= 1
assert export_data["trace_id"] == trace_id and export_data["format"] == "speedscope"
assert isinstance(export_data["download_url"], str) and export_data["download_url"].startswith("/api/trace/download/")
assert isinstance(export_data["file_size_bytes"], int) and export_data["file_size_bytes"] > 0
deleted = requests.get(f"{BASE_URL}/api/trace/list").json()
assert trace_id not in deleted["active_traces"]
print("GUIDE PYTHON EXAMPLE OK")
