# Rewrites the launcher headers for the CPU emulation: every kernel<<<grid, block, ...>>>(args)
# becomes emu::launch(grid, block, [&] { kernel(args); }), and block-cooperative launches use
# one thread per block (threads = 1), which the single-thread CUB block stubs require.
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
        k=j; depth=0
        while k>0:
            c=src[k-1]
            if c=='>': depth+=1
            elif c=='<': depth-=1
            elif depth==0 and not (c.isalnum() or c in '_:'): break
            k-=1
        name=src[k:j]
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
        out+=src[i:k]+'emu::launch(%s, %s, [&] { %s(%s); })' % (cfg[0], cfg[1], name, args)
        i=p
    return out
src, dst = sys.argv[1], sys.argv[2]
for f in sys.argv[3:]:
    s=open(os.path.join(src, f)).read()
    s=s.replace('constexpr int threads = 256;','constexpr int threads = 1;')
    s=transform(s)
    open(os.path.join(dst, f),'w').write('#include <emu_shim.hpp>\n'+s)
