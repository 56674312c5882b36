"""What every page of the testbed shares: one self-contained HTML document (inline style and script,
nothing fetched) and the tables it is made of.

The pages read with scripts off; the script only adds hover details and zoom on
the timeline's time axis (wheel or the buttons; drag to pan; double-click to
reset).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from html import escape
from typing import Any

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,sans-serif;margin:0 auto;max-width:1160px;
padding:0 16px 40px;color:#222;background:#fff}h1{font-size:22px;margin:18px 0 4px}h2{
font-size:17px;margin:26px 0 8px;border-bottom:1px solid #ddd}table{border-collapse:collapse;
margin:6px 0}th,td{border:1px solid #ddd;padding:3px 7px;text-align:left;vertical-align:top}th{
background:#f4f4f4}td.num{text-align:right;font-variant-numeric:tabular-nums}.verdict{
display:inline-block;padding:2px 10px;border-radius:4px;color:#fff;font-weight:600}.pass{
background:#2e7d32}.fail{background:#c62828}.unknown,.other{background:#757575}
.aborted,.crash,.invalid,.interrupted,.head_lost{background:#6a1b9a}tr.status-fail td:first-child{
border-left:4px solid #c62828}tr.status-pass td:first-child{border-left:4px solid #2e7d32}code,pre{
font:12px/1.4 ui-monospace,Menlo,Consolas,monospace;background:#f6f6f6}pre{padding:6px;
overflow:auto;max-height:300px}details summary{cursor:pointer;color:#555}.legend span{
display:inline-block;margin:0 10px 2px 0}.legend i{display:inline-block;width:12px;height:12px;
margin-right:4px;vertical-align:-2px}svg text{font:11px system-ui,sans-serif;fill:#333}
svg .fault-label{fill:#7f1d1d;font-weight:600}#zoom button{margin-right:4px}#tip{position:fixed;
pointer-events:none;background:#222;color:#fff;padding:3px 7px;border-radius:3px;font-size:12px;
display:none;max-width:480px;z-index:9}.muted{color:#666}
"""

SCRIPT = """
(function(){
 var svg=document.getElementById('timeline'), tip=document.getElementById('tip');
 document.querySelectorAll('[data-tip], svg rect, svg line, svg circle').forEach(function(el){
  var t=el.querySelector('title'); if(!t||!tip) return;
  el.addEventListener('mousemove',function(ev){tip.textContent=t.textContent;tip.style.display='block';
   tip.style.left=(ev.clientX+12)+'px';tip.style.top=(ev.clientY+12)+'px';});
  el.addEventListener('mouseleave',function(){tip.style.display='none';});
 });
 if(!svg) return;
 var T0=parseFloat(svg.dataset.t0), T1=parseFloat(svg.dataset.t1), L=parseFloat(svg.dataset.left),
     R=parseFloat(svg.dataset.right), a=T0, b=T1, axis=svg.querySelector('g.axis'),
     ticksY=parseFloat(axis.dataset.ticks), stat=svg.querySelector('g.static-ticks'),
     shapes=svg.querySelectorAll('[data-a]'), NS='http://www.w3.org/2000/svg';
 function X(t){return L+(t-a)/(b-a)*(R-L);}
 function draw(){
  shapes.forEach(function(el){var ta=parseFloat(el.dataset.a);
   if(el.tagName==='rect'){var tb=parseFloat(el.dataset.b);el.setAttribute('x',X(ta));
    el.setAttribute('width',Math.max(0.6,X(tb)-X(ta)));}
   else if(el.tagName==='line'){el.setAttribute('x1',X(ta));el.setAttribute('x2',X(ta));}
   else if(el.tagName==='text'){el.setAttribute('x',X(ta)+parseFloat(el.dataset.dx||0));}});
  if(stat) stat.style.display='none';
  while(axis.firstChild) axis.removeChild(axis.firstChild);
  for(var i=0;i<=6;i++){var t=a+(b-a)*i/6, s=document.createElementNS(NS,'text');
   s.setAttribute('x',X(t));s.setAttribute('y',ticksY);
   s.setAttribute('text-anchor',i===0?'start':i===6?'end':'middle');
   s.textContent=t.toPrecision(4)+' s';axis.appendChild(s);}
  var z=document.getElementById('zoom-range');
  if(z) z.textContent=a.toPrecision(5)+' s to '+b.toPrecision(5)+' s';
 }
 function zoom(f,c){var t=(c===undefined)?(a+b)/2:c, na=t-(t-a)*f, nb=t+(b-t)*f;
  if(nb-na<(T1-T0)*1e-6) return; a=Math.max(T0,na); b=Math.min(T1,nb); draw();}
 function at(ev){var r=svg.getBoundingClientRect(), px=(ev.clientX-r.left)*svg.viewBox.baseVal.width/r.width;
  return a+(px-L)/(R-L)*(b-a);}
 svg.addEventListener('wheel',function(ev){ev.preventDefault();zoom(ev.deltaY<0?0.8:1.25,at(ev));},{passive:false});
 var drag=null;
 svg.addEventListener('mousedown',function(ev){drag={x:at(ev),a:a,b:b};});
 window.addEventListener('mouseup',function(){drag=null;});
 svg.addEventListener('mousemove',function(ev){if(!drag) return; var d=drag.x-at(ev), w=b-a;
  a=Math.max(T0,Math.min(T1-w,a+d)); b=a+w; draw();});
 svg.addEventListener('dblclick',function(){a=T0;b=T1;draw();});
 document.querySelectorAll('#zoom button').forEach(function(btn){btn.addEventListener('click',function(){
  var f=parseFloat(btn.dataset.zoom); if(f) zoom(f); else {a=T0;b=T1;draw();}});});
 document.getElementById('zoom').style.display='block';
 draw();
})();
"""


def page(title: str, body: Iterable[str]) -> str:
    """A whole HTML document: ``title`` and the ``body`` parts, with the shared style and script inline."""
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        '<link rel="icon" href="data:,">'
        f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>"
        + "".join(body)
        + f'<div id="tip"></div><script>{SCRIPT}</script></body></html>\n'
    )


def table(head: list[str], rows: Iterable[list[str]], cls: str = "", numeric: Iterable[int] = ()) -> str:
    """A table of already-escaped cells; the columns in ``numeric`` are right-aligned."""
    right = set(numeric)
    out = [
        f'<table class="{cls}"><thead><tr>' + "".join(f"<th>{h}</th>" for h in head) + "</tr></thead><tbody>"
    ]
    for row in rows:
        out.append(
            "<tr>" + "".join(f'<td class="num">{c}</td>' if i in right else f"<td>{c}</td>"
                             for i, c in enumerate(row)) + "</tr>"
        )  # fmt: skip
    return "".join(out) + "</tbody></table>"


def verdict_badge(verdict: str) -> str:
    """The verdict as a coloured badge."""
    cls = verdict if verdict in ("pass", "fail", "unknown") else "other"
    return f'<span class="verdict {cls}" id="verdict">{escape(verdict.upper())}</span>'


def as_json(value: Any) -> str:
    """``value`` as indented JSON, escaped for a ``<pre>``."""
    return escape(json.dumps(value, indent=1, sort_keys=True, default=str))


def seconds(value: Any) -> str:
    """A figure of seconds, short."""
    return "" if value is None else f"{float(value):.4g} s"
