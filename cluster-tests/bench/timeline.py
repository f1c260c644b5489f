#!/usr/bin/env python3
"""One message's timeline on a queue leader, from the broker's `timeline` trace events.

Run the broker with RUST_LOG="info,timeline=trace" (every node of a cluster), drive a fixed
rate (quorumq-perf --rate R), then:

    cluster-tests/bench/timeline.py data/node-1.log [GROUP]

Prints, per stage, the time since the proposer submitted the entry (p50/p90/p99, ms):
wal_append / wal_flushed (leader's WAL write and sync), ae_sendN / ae_replyN (AppendEntries
to follower N and its answer), apply (the leader's state machine), reply (the proposer gets
the result; the confirm is written right after). GROUP defaults to the first queue group
that submitted anything. Issue 9's breakdown was measured with it.
"""
import datetime
import re
import sys

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def ts(s):
    d=datetime.datetime.strptime(s[:26],"%Y-%m-%dT%H:%M:%S.%f"); return d.timestamp()*1e3
def events(path):
    out=[]
    for line in open(path):
        line = ANSI.sub('', line)
        if 'timeline:' not in line: continue
        t=ts(line.split()[0]); kv=dict(re.findall(r'(\w+)=("?[^ ]+"?)',line.rstrip().split('timeline:')[1]))
        kv={k:v.strip('"') for k,v in kv.items()}; kv['t']=t; out.append(kv)
    return out
L=events(sys.argv[1]); G=sys.argv[2] if len(sys.argv)>2 else None
subs=[e for e in L if e['ev']=='submit' and (G is None or e['group']==G)]
G=G or subs[0]['group']
subs=[e for e in L if e['ev']=='submit' and e['group']==G]
apps=[e for e in L if e['ev']=='apply' and e['group']==G]
reps=[e for e in L if e['ev']=='reply' and e['group']==G]
# align: last len(subs) applies
apps=apps[-len(subs):]
app_by_idx={int(a['index']):a['t'] for a in apps}
wal=[e for e in L if e['ev']=='wal_append' and e['group']==G]
fl=[e for e in L if e['ev']=='wal_flushed' and e['group']==G]
ae=[e for e in L if e['ev'] in('ae_send','ae_reply') and e['group']==G and int(e['n'])>0]
def first_after(evs, idx, key='last', pred=lambda e:True):
    for e in evs:
        if int(e[key])>=idx and pred(e): return e['t']
rows=[]
import bisect
walL=[(int(e['last']),e['t']) for e in wal]; flL=[(int(e['last']),e['t']) for e in fl]
def first_ge(lst, idx, after=0):
    for l,t in lst:
        if l>=idx and t>=after: return t
stages={}
skip=int(len(subs)*0.1)
rep_by_seq={e['seq']:e for e in reps}
for k,(s,a) in enumerate(zip(subs,apps)):
    r=rep_by_seq.get(s['seq'])
    if r is None: continue
    if k<skip or k%5: continue
    idx=int(a['index']); t0=s['t']
    d={}
    d['wal_append']=first_ge(walL,idx,t0)
    d['wal_flushed']=first_ge(flL,idx,t0)
    for tgt in ('2','3'):
        for ev in ('ae_send','ae_reply'):
            for e in ae:
                if e['ev']==ev and e['target']==tgt and int(e['last'])>=idx and int(e['last'])-int(e['n'])<idx and e['t']>=t0:
                    d[ev+tgt]=e['t'];break
    d['apply']=a['t']; d['reply']=r['t']
    for k2,v in d.items():
        if v is not None: stages.setdefault(k2,[]).append(v-t0)
for k2,v in stages.items():
    v.sort(); print("%-12s n=%5d p50 %.3f p90 %.3f p99 %.3f ms"%(k2,len(v),v[len(v)//2],v[int(len(v)*.9)],v[int(len(v)*.99)]))
