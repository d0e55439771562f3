"""The library the scripts import: everything around the model that runs an experiment and that a researcher forking
the project rarely edits. Files and folders (fileio), tokenizers, documents and prepared data (tokenizer, sources,
dataset, train_data), the config schema (train_config), devices and process groups (devices, fsdp), optimizers
(optimizers), run folders and checkpoints (runs), the measurements (measure), tables and figures (tables, plots,
paper_tables), the scales and recipes of reproduce.py (scales, recipe), provenance and the speed report (provenance,
bench_report), the files of a GPU queue call and their unpacking (device_files), and how every script ends (entry: its
signals, a full disk, its children). It imports model.py, orthoadam.py and configurator.py, never a script
(docs/architecture.md)."""
