"""The benchmark suite's parts and the harness's launcher of server processes (bench/, testing/)."""
