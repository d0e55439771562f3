# Laptop pilot 7: the pinned corpus's archive subset in bytes (python prepare_c4.py --source pinned --subset archive
# --tokenizer bytes --out_dir data/pinned_archive_bytes: 44,932 train documents) instead of the CPU subset's 4,724, so
# document windows do not repeat: 900 steps of 16 read 14,400 of its document starts, each once at most.
include('base.py')
out_dir = 'out/laptop/pilots/p07_archive'
dataset = 'pinned_archive_bytes'
