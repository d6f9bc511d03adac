# Rewrites headers for the CPU emulation (tests/emulation/README.md).
#   transform.py SRC DST FILES...             the dispatch family: every
#       kernel<<<grid, block, ...>>>(args) becomes emu::launch(grid, block, [&] { kernel(args); }),
#       and block-cooperative launches use one thread per block (threads = 1), which the
#       single-thread CUB block stubs require.
#   transform.py --lockstep SRC DST FILES...  the gating / loss / backward family: launches become
#       emu::ls::launch(grid, block, dynamic smem bytes, [=] { kernel(args); }) (arguments by
#       value, as a CUDA launch copies them) with every thread a fiber
#       (inc/emu_lockstep.hpp), and `extern __shared__ T name[];` becomes a pointer to the
#       emulated block's dynamic shared memory.
import os, re, sys
def split_top(s):
    parts=[]; depth=0; cur=''
    for ch in s:
        if ch in '(<[{': depth+=1
        if ch in ')>]}': depth-=1
        if ch==',' and depth==0: parts.append(cur); cur=''
        else: cur+=ch
    parts.append(cur); return [p.strip() for p in parts]
def transform(src):
    out=''; i=0
    while True:
        j=src.find('<<<', i)
        if j<0: out+=src[i:]; break
        # kernel name: go back over [\w:<>, ] until whitespace at depth 0
        k=j
        while src[k-1].isspace(): k-=1  # a launch may break the line before <<<
        name_end=k; depth=0
        while k>0:
            c=src[k-1]
            if c=='>': depth+=1
            elif c=='<': depth-=1
            elif depth==0 and not (c.isalnum() or c in '_:'): break
            k-=1
        name=src[k:name_end]
        e=src.find('>>>', j)
        cfg=split_top(src[j+3:e])
        assert src[e+3]=='(', src[e:e+20]
        # matching paren
        p=e+4; depth=1
        while depth:
            if src[p]=='(': depth+=1
            elif src[p]==')': depth-=1
            p+=1
        args=src[e+4:p-1]
        if lockstep:
            smem = cfg[2] if len(cfg) > 2 else '0'
            out+=src[i:k]+'emu::ls::launch(%s, %s, %s, [=] { %s(%s); })' % (cfg[0], cfg[1], smem, name, args)
        else:
            out+=src[i:k]+'emu::launch(%s, %s, [&] { %s(%s); })' % (cfg[0], cfg[1], name, args)
        i=p
    return out
argv = sys.argv[1:]
lockstep = argv[0] == '--lockstep'
if lockstep: argv = argv[1:]
src, dst = argv[0], argv[1]
for f in argv[2:]:
    s=open(os.path.join(src, f)).read()
    if lockstep:
        s=re.sub(r'extern __shared__ (\w+) (\w+)\[\];', r'\1* \2 = static_cast<\1*>(emu::ls::dynamic_shared());', s)
        head='#include <emu_lockstep.hpp>\n'
    else:
        s=s.replace('constexpr int threads = 256;','constexpr int threads = 1;')
        head='#include <emu_shim.hpp>\n'
    s=transform(s)
    os.makedirs(os.path.dirname(os.path.join(dst, f)), exist_ok=True)
    open(os.path.join(dst, f),'w').write(head+s)
