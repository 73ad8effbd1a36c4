#!/usr/bin/env bash
# One job of the fine-tuning extension study (docs/results.md, "Context extension by
# fine-tuning"), one thread: bash scripts/extension_study/job.sh TYPE KIND SEED; skipped when its
# extrapolation.json exists, so a queue of them resumes. PARENTS: the folder holding rope_s1234,
# rope_s1, rope_s2 (the every-scheme command at trainer.max_steps=300, fp32; default
# outputs/study45; word vocabulary version 1, as every committed study); OUT: where the jobs
# write (default outputs/extension_study).
#   base - S        the parent evaluated as trained
#   search - S      LongRoPE's factor search at T=512 on the parent
#   eval0 KIND S    the parent with eval.rope_scaling.kind=KIND factor 4 (= extend= with 0 steps)
#   ftK KIND S      extend= to L=512 with +pos.scaling.kind=KIND factor 4, K fine-tuning steps
#   plainK - S      extend= to L=512 with no extension (rope fine-tuned longer), K steps
#   dropeK - S      extend= pos=nope (DroPE) at L=128, K ≥ 1 recalibration steps
#   ctx - S         context use (c = 32) of the parent at 1-16x
#   scratch - S     rope from scratch at L=512, the parent's tokens plus 50 steps'
#   slide ROW S     the row's run (base: the parent; else the job folder ROW_sS) scored in the
#                   sliding mode (stride L/2) on the first 16,384 validation tokens
#   cuse ROW S      the row's run (base: the parent; = the ctx job): context use (c = 32) at 128-2048
# The needle (experiment=tasks_needle_cpu): rope at L=64 extended to 256, scored at 64-1024
#   nparent - S     rope trained on the needle at L=64 (the task study's command)
#   nbase - S       that parent scored as trained
#   neval0 KIND S   the parent with eval.rope_scaling.kind=KIND factor 4
#   nftK KIND S     extend= to L=256 with +pos.scaling.kind=KIND factor 4, K steps
#   nplainK - S     extend= to L=256 with no extension, K steps
#   ndropeK - S     extend= pos=nope (DroPE) at L=64, K steps
cd "$(dirname "$0")/../.."   # the repository root
type=$1; kind=$2; s=$3
P=${PARENTS:-outputs/study45}/rope_s$s; D=${OUT:-outputs/extension_study}
EV="eval.lengths=[128,256,512,1024,2048] eval.modes=[nonoverlapping] eval.max_tokens=65536 eval.precision=32-true"
FT="experiment=extrapolation_cpu trainer.precision=32-true logger=csv seed=$s"
factors() { [ "$kind" = longrope ] && echo "$1.factors_file=$D/longrope_s$s/longrope_factors.json"; }
export OMP_NUM_THREADS=1
NP=$D/needle_rope_s$s
NEV="eval.lengths=[64,128,256,512,1024] eval.task_examples=50"   # as committed (the default is now 250)
NFT="experiment=tasks_needle_cpu data=needle seed=$s train.stop_at_accuracy=null eval.task_examples=50"
case $type in
  base) O=$D/base_s$s; [ -f $O/extrapolation/extrapolation.json ] && exit 0
    python eval.py run=$P $EV out_dir=$O wandb=false ;;
  search) [ -f $D/longrope_s$s/longrope_factors.json ] && exit 0
    python scripts/longrope_search.py $P --target 512 --out $D/longrope_s$s --quiet ;;
  eval0) O=$D/eval0_${kind}_s$s; [ -f $O/extrapolation/extrapolation.json ] && exit 0
    python eval.py run=$P $EV out_dir=$O wandb=false eval.rope_scaling.kind=$kind \
      eval.rope_scaling.factor=4 $(factors eval.rope_scaling) ;;
  plain*) K=${type#plain}; O=$D/plain${K}_s$s; [ -f $O/extrapolation/extrapolation.json ] && exit 0
    python train.py $FT extend=$P data.seq_len=512 data.batch_size=8 trainer.max_steps=$K \
      trainer.val_check_interval=$K $EV hydra.run.dir=$O resume=auto ;;
  ft*) K=${type#ft}; O=$D/ft${K}_${kind}_s$s; [ -f $O/extrapolation/extrapolation.json ] && exit 0
    python train.py $FT extend=$P data.seq_len=512 data.batch_size=8 +pos.scaling.kind=$kind \
      +pos.scaling.factor=4 $(factors +pos.scaling) trainer.max_steps=$K \
      trainer.val_check_interval=$K $EV hydra.run.dir=$O resume=auto ;;
  drope*) K=${type#drope}; O=$D/drope${K}_s$s; [ -f $O/extrapolation/extrapolation.json ] && exit 0
    python train.py $FT extend=$P pos=nope trainer.max_steps=$K \
      trainer.val_check_interval=$K $EV hydra.run.dir=$O resume=auto ;;
  ctx) O=$D/ctx_rope_s$s; [ -f $O/extrapolation/extrapolation.json ] && exit 0
    python eval.py run=$P eval.short_context=32 eval.max_tokens=65536 eval.precision=32-true \
      out_dir=$O wandb=false ;;
  scratch) O=$D/scratch512_s$s; [ -f $O/extrapolation/extrapolation.json ] && exit 0
    python train.py $FT pos=rope data.seq_len=512 data.batch_size=8 data.tokenizer_version=1 trainer.max_steps=350 \
      trainer.val_check_interval=175 $EV hydra.run.dir=$O resume=auto ;;
  slide) R=$D/${kind}_s$s; [ "$kind" = base ] && R=$P; O=$D/slide_${kind}_s$s
    [ -f $O/extrapolation/extrapolation.json ] && exit 0
    python eval.py run=$R eval.lengths=[128,256,512,1024,2048] eval.modes=[sliding] \
      eval.max_tokens=16384 eval.precision=32-true out_dir=$O wandb=false ;;
  cuse) R=$D/${kind}_s$s; [ "$kind" = base ] && R=$P; O=$D/cuse_${kind}_s$s
    [ -f $O/extrapolation/extrapolation.json ] && exit 0
    python eval.py run=$R eval.lengths=[128,256,512,1024,2048] eval.short_context=32 \
      eval.max_tokens=65536 eval.precision=32-true out_dir=$O wandb=false ;;
  nparent) grep -q '"status": "completed"' $NP/status.json 2>/dev/null && exit 0
    python train.py experiment=tasks_needle_cpu data=needle pos=rope seed=$s eval.task_examples=50 \
      hydra.run.dir=$NP resume=auto ;;
  nbase) O=$D/nbase_s$s; [ -f $O/extrapolation/extrapolation.json ] && exit 0
    python eval.py run=$NP $NEV out_dir=$O wandb=false ;;
  neval0) O=$D/neval0_${kind}_s$s; [ -f $O/extrapolation/extrapolation.json ] && exit 0
    python eval.py run=$NP $NEV out_dir=$O wandb=false eval.rope_scaling.kind=$kind \
      eval.rope_scaling.factor=4 ;;
  nft*) K=${type#nft}; O=$D/nft${K}_${kind}_s$s; [ -f $O/extrapolation/extrapolation.json ] && exit 0
    python train.py $NFT extend=$NP data.seq_len=256 +pos.scaling.kind=$kind \
      +pos.scaling.factor=4 trainer.max_steps=$K trainer.val_check_interval=$K $NEV \
      hydra.run.dir=$O resume=auto ;;
  nplain*) K=${type#nplain}; O=$D/nplain${K}_s$s; [ -f $O/extrapolation/extrapolation.json ] && exit 0
    python train.py $NFT extend=$NP data.seq_len=256 trainer.max_steps=$K \
      trainer.val_check_interval=$K $NEV hydra.run.dir=$O resume=auto ;;
  ndrope*) K=${type#ndrope}; O=$D/ndrope${K}_s$s; [ -f $O/extrapolation/extrapolation.json ] && exit 0
    python train.py $NFT extend=$NP pos=nope trainer.max_steps=$K \
      trainer.val_check_interval=$K $NEV hydra.run.dir=$O resume=auto ;;
esac
